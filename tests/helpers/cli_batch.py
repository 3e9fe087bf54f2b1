"""Run several `dsv4-convert` command lines in ONE Python process, each exactly as the console script
would (`main(argv)`, its SystemExit code, its stdout and stderr), and print the outcomes as JSON.

The catalogue runs dozens of commands; a fresh interpreter per command costs seconds of torch import
each. An exception that escapes `main` is recorded as a crash (a real process would print a traceback
and exit 1), so a non-DsvError failure is visible to the test, never hidden.

    python cli_batch.py commands.json   # [[argv...], ...]  ->  stdout: [{"code", "stdout", "stderr", "crash"}]
    python cli_batch.py --serve         # one argv (JSON) a line on stdin -> one RESULT line each on stdout

--serve keeps one process for a whole test session (serving_tests/synth.py run_converter: the checkpoints the
engine tests load); its answers are the lines that start with RESULT, anything else on stdout is not one.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback
import warnings


def _run(argv: list[str]) -> dict:
    from dsv4_convert.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    code, crash = 0, None
    # catch_warnings: each command starts with the process's filters and forgets which warnings were shown, so a
    # warning an earlier command printed is printed again, as in a fresh process (a "stderr is empty" test sees it)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        try:
            main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 (the point is to record anything that escapes)
            code, crash = 1, traceback.format_exc()
    return {"argv": argv, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "crash": crash}


RESULT = "\x1eRESULT "  # an answer's line in --serve mode


def serve() -> None:
    out = sys.stdout  # _run redirects sys.stdout per command: the answers go to the real one
    for line in sys.stdin:
        out.write(RESULT + json.dumps(_run([str(a) for a in json.loads(line)])) + "\n")
        out.flush()


def main() -> None:
    if sys.argv[1] == "--serve":
        return serve()
    with open(sys.argv[1]) as f:
        commands = json.load(f)
    results = [_run([str(a) for a in argv]) for argv in commands]
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()
