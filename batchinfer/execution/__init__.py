"""One job, start to end: the driver, the executors that run chunk tasks, a chunk's task, the report.
(Not `run/`: a subpackage of that name would hide the `batchinfer.run` function.)"""
