"""``llmretry batch IN -o OUT --via batch-api``: the batch command on the
Batch API (llmretry.batch_api), writing the same results and failures
files as the realtime path (docs/batch.md, "The Batch API").

The job's record is ``--failures PATH`` + ``.batches`` (else ``-o PATH`` +
``.batches``). ``--resume`` with a record polls the batches it names and
collects those not collected yet; without one it is a first run. Ctrl-C
while waiting detaches (exit 130; the batches go on, ``--resume`` picks
them up); a second Ctrl-C within 3 s cancels them and waits for them. A
call of the job's own that fails (the upload, a poll: after its retries)
is one line and exit status 1.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List, Optional

from .errors import LLMError

VIA = ("realtime", "batch-api")


def add_flags(p: argparse.ArgumentParser) -> None:
    """The batch command's Batch API flags."""
    p.add_argument("--via", choices=VIA, default="realtime",
                   help="batch-api: through the provider's Batch API (half the price, "
                        "results within 24 h; docs/batch.md)")
    p.add_argument("--keep-files", action="store_true",
                   help="--via batch-api: leave the uploaded and result files at the "
                        "provider")
    p.add_argument("--then-realtime", action="store_true",
                   help="--via batch-api: send the requests the batches failed (expired, "
                        "cancelled, errors) through the realtime path in the same run")
    p.add_argument("--poll-interval-ms", type=int, default=5000, metavar="MS",
                   help="--via batch-api: the first wait between polls (it grows x1.5 "
                        "to 60 s; default 5000)")
    p.add_argument("--batch-endpoint", dest="batch_endpoint", default=None, metavar="PATH",
                   help="--via batch-api: the requests' endpoint (default "
                        "/v1/chat/completions; /v1/embeddings, /v1/responses)")


def run(args: argparse.Namespace, cli: Any, inp: Any, n: int, bad: Dict[int, str],
        client: Any, options: Dict[str, Any], logger: Any, results: Any,
        kept: Any, bar: Any, output: Any, interrupts: Any, write: Any) -> int:
    """The run after the command's checks (``cli`` is llmretry.cli, whose
    helpers write the files): the exit status."""
    # Here, not at the top: `llmretry call` and a realtime batch never load
    # the Batch API (urllib.request, uuid, hashlib: 16 ms of every command).
    from . import _batch_api_wait, batch_api
    UsageError = cli.UsageError
    if bad:
        raise cli._bad_lines_error(args.input, bad)
    for flag, on in (("--stream", args.stream), ("--schema", args.schema is not None),
                     ("--skip-invalid", args.skip_invalid)):
        if on:
            raise UsageError(f"{flag} does not go with --via batch-api")
    if args.failures is not None:
        record: Optional[str] = args.failures + ".batches"
    elif output.regular:
        record = output.path + ".batches"
    else:
        record = None
    bodies: List[Any] = list(cli._requests(inp, args.model, False, bad))
    api_opts: Dict[str, Any] = {k: options[k] for k in (
        "base_url", "timeout_ms", "max_retries", "base_delay_ms", "max_delay_ms", "jitter")
        if k in options}
    if args.call_deadline_ms is not None:
        api_opts["call_deadline_ms"] = args.call_deadline_ms
    api_opts.update(logger=logger, poll_interval_ms=args.poll_interval_ms,
                    keep_files=args.keep_files)
    batch = cli._CliBatch(bodies, failures_path=args.failures,
                          resume=args.resume and args.failures is not None, progress=False,
                          on_result=results.append, logger=logger, parse_items=True,
                          keep_results=False)
    batch.interrupts = interrupts
    realtime: Dict[str, Any] = dict(options, limit=args.limit)
    if args.call_deadline_ms is not None:
        realtime["call_deadline_ms"] = args.call_deadline_ms
    job = None
    collecting = False
    # One handler from the first upload to the last result: Ctrl-C anywhere
    # in between is handled here (never a bare KeyboardInterrupt).
    with interrupts.installed():
        try:
            try:
                if args.resume and record is not None and os.path.exists(record):
                    job = batch_api._load_job(bodies, record=record,
                                              endpoint=args.batch_endpoint, client=client,
                                              **api_opts)
                else:
                    job = batch_api._new_job(bodies, record=record,
                                             endpoint=args.batch_endpoint, client=client,
                                             **api_opts)
            except (ValueError, TypeError) as exc:
                raise UsageError(f"{args.input}: {exc}") from None

            def submitted(job: Any) -> None:
                write(f"{cli.PROG}: {len(job.batch_ids)} batch(es): "
                      f"{', '.join(job.batch_ids)}" + (f" (record: {record})" if record else ""))
                if bar is not None:
                    bar.start(n)
            _batch_api_wait._interruptible_wait(job, bar, 3.0, write, submitted)
            collecting = True
            job.results(batch=batch, then_realtime=args.then_realtime,
                        already_ok=kept, **realtime)
        except KeyboardInterrupt as exc:
            results.close()
            if job is not None and not collecting and not isinstance(
                    exc, batch_api.BatchDetached):
                try:    # a Ctrl-C just before the wait: as one in it
                    _batch_api_wait._detach_or_cancel(job, 3.0, write)
                except batch_api.BatchDetached as detached:
                    exc = detached
            if isinstance(exc, batch_api.BatchDetached):
                write(f"{cli.PROG}: {exc}" + ("" if exc.cancelled or not record else
                                              "; run the same command with --resume to "
                                              "collect them"))
            elif batch.summary is not None:
                cli._print_summary(batch.summary, output.name, args.failures,
                                   interrupted=True)
            return 130
        except LLMError as exc:
            # The job's own calls (upload, create, poll, download) failed
            # after their retries: one line, and how to go on.
            results.close()
            made = job.batch_ids if job is not None else []
            write(f"{cli.PROG}: batch API: {exc}" + (
                f"; the batches made go on ({', '.join(made)}): run the same command "
                f"with --resume to collect them" if made and record else ""))
            return 1
        finally:
            if bar is not None:
                bar.close()
    results.finish(n)
    summary = batch.summary
    assert summary is not None
    cli._print_summary(summary, output.name, args.failures, interrupted=False)
    return 0 if summary.failed == 0 else 1
