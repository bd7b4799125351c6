"""The write pipeline: queue, write-ahead spool, retries and the insert into the store."""
