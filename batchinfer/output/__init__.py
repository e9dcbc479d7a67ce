"""The output folder: part files, completion markers, the job record, the lock and the report.

    part-SSSSS-CCCCC.parquet          results of chunk C of shard S (lexical order = input order)
    _errors/part-SSSSS-CCCCC.parquet  rows that could not run, each with a reason
    _errors/skipped-shards.parquet    shards left out (input.on_bad_shard: skip)
    _done/SSSSS-CCCCC.json            completion marker: the chunk's record
    _batchinfer.json                  the job: its id, fingerprint and the batching a probe chose
    _lock                             the run holding the folder
    _report.json, _SUCCESS            totals of the last run; _SUCCESS once every chunk is done

Commit protocol: a chunk is done when its marker exists. Its part files are written whole under their
final names first (a temporary file, fsync, rename), then the marker. After a crash, a part without a
marker is a leftover of the chunk in flight and is removed when the next run opens the folder; nothing
is ever appended, so there is no torn line to mend. Every open checks each marker against the part files
it committed (present, this job's id in the footer, its rows): a chunk whose part went missing runs again,
and _SUCCESS is written only over every committed part.

Ownership: every file carries the job's id (in the Parquet footer, in the JSON, or in a temporary
file's name), so batchinfer deletes or overwrites only what it can prove it wrote. A folder holding
anything else is refused before any change, and so are /, the home folder and the input itself.

The modules, bottom up: layout (names), records (ChunkRecord, ChunkResult), failures (errors in words),
job_record, lock, scan (one read of a folder), ownership, parts (part files), formats (one class per
output.format), checkpoint (what a run holds: lock, finished chunks, commit), status (read only).
"""
