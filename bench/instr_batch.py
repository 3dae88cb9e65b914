"""One ``call_many`` of N items (bench_batch.py's bodies, against the
benchmarks' local nginx), for bench/instr_batch.sh: counted under callgrind
(the calling thread's instructions, load-independent), and the cyclic GC's
side of it in this process.

    python3 bench/instr_batch.py --base-url URL --n N [--limit 64]
        [--logger none|default] [--gc-counts] [--no-batch]

``--no-batch`` does all but the measured ``call_many`` (the client, its
warm-up batch, the N bodies): instr_batch.sh subtracts it, so that its
count is the batch's alone. Either way the process ends with ``os._exit``
once done (freeing the results is the caller's, whenever it drops them).

``--gc-counts`` runs the batch with the GC's automatic collections off
(a huge gen-0 threshold keeps the count running) and prints ``GC
kept=K`` (the net change of the gen-0 count over the batch ÷ N: objects
the GC counts, made and still alive after it, per item; what sets off
its collections), then the same batch with the default thresholds and
``collections=g0/g1/g2``, each generation's collections over it.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import llmretry  # noqa: E402

import peers_python  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--limit", type=int, default=64)
    ap.add_argument("--logger", choices=("none", "default"), default="none")
    ap.add_argument("--gc-counts", action="store_true")
    ap.add_argument("--no-batch", action="store_true")
    args = ap.parse_args()
    kwargs = {"base_url": args.base_url, "api_key": peers_python.API_KEY,
              "max_in_flight": max(256, args.limit)}
    if args.logger == "none":
        kwargs["logger"] = None
    with llmretry.Client(**kwargs) as client:
        client.call_many([peers_python.body_for(i) for i in range(8)], limit=args.limit)
        bodies = [peers_python.body_for(i) for i in range(args.n)]
        gc.collect()
        if args.no_batch:
            return
        if args.gc_counts:
            t = gc.get_threshold()
            gc.set_threshold(1 << 30, t[1], t[2])
            c0 = gc.get_count()[0]
            out = client.call_many(bodies, limit=args.limit)
            tracked = gc.get_count()[0] - c0
            gc.set_threshold(*t)
            check(out, args.n)
            del out
            gc.collect()
            s0 = [s["collections"] for s in gc.get_stats()]
        out = client.call_many(bodies, limit=args.limit)
        check(out, args.n)
        if args.gc_counts:
            s1 = [s["collections"] for s in gc.get_stats()]
            print(f"GC kept={tracked / args.n:.2f} collections="
                  + "/".join(str(b - a) for a, b in zip(s0, s1)))


def check(out: "llmretry.BatchResult", n: int) -> None:
    if out.summary.ok != n:
        raise SystemExit(f"{out.summary.failed} of {n} items failed")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
