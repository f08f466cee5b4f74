#!/usr/bin/env python3
"""Xid collector: kernel-log parse throughput, append-to-/metrics latency, and a 50,000 records/s flood.

    .venv/bin/python benchmarks/xid.py [--records 1000000] [--repetitions 5] [--events 1000]
                                       [--flood-seconds 60] [--flood-rate 50000]
                                       [--before DIR [--floods-only]]

The three targets of the Xid collector, each beside a peer in the same run:

1. Parse throughput (target >= 200,000 records/s): ~1,000,000 records cycling
   the real kernel records of tests/fixtures/kmsg/real-other.kmsg (seq
   renumbered, contiguous), with every 1,000th record one of the 98 real NVRM
   Xid records of real-xid.kmsg. Ours: XidTracker._handle (parse, seq/lost
   accounting, counting under the lock) over batches of 4096 raw records, as the
   reader hands them over. Peer 1, the naive log-monitor way: one compiled regex
   searched in every decoded line. Peer 2, an upper bound in C: `grep -c 'NVRM:
   Xid'` over the same records in a file, wall time of the whole process.
2. Latency from appending one Xid record to the log to seeing the counter rise in
   /metrics (target p99 < 100 ms): two exporters side by side, one following a
   regular file, one a FIFO; events alternate between them; /metrics is polled
   on a keep-alive connection until the counter total rises. Also the duration
   of a scrape alone.
3. Flood (target: 50,000 records/s for 60 s with one Xid per 1,000 records,
   every Xid counted or every gap counted as lost, RSS stable): a writer thread
   appends paced batches to the file the exporter follows; the exporter's RSS,
   CPU and counts are sampled every second. Peer: the same flood beside the same
   exporter with only the staging collector (no Xid thread), for the RSS and CPU
   the Xid thread adds.

4. With --before DIR (a checkout of earlier code with its own .venv): floods by kind at the same
   rate, this commit's exporter beside the earlier one's on the same bytes: today's Xid flood, a
   dense Xid flood (every record an Xid), an SXid flood (one SXid and its Severity and Data lines
   over and over, as a driver floods) and a mixed kernel-event flood (the real records of
   real-kernel-events.kmsg cycled). Every event counted, series as few as written, lag and CPU.

Results: tables on stdout and benchmarks/results/xid.json (every raw number).
The code is in benchmarks/xid_bench/, a module per concern; this file is its command line.
"""

import sys

from xid_bench.cli import main  # benchmarks/ is on sys.path when run as a script

if __name__ == "__main__":
    sys.exit(main(description=(__doc__ or "").splitlines()[0]))
