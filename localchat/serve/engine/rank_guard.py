"""One local rank of a distributed server, that never outlives the ``localchat serve`` behind it.

``mlx.launch`` starts the ranks; when ``serve`` is killed, even with SIGKILL, its launcher dies with
it (a parent-death signal), but the ranks it started would go on serving. So each local rank runs
``python -m localchat.serve.engine.rank_guard mlx_lm server …``: mlx_lm's own command, in this process,
beside a thread that ends the rank at once when its launcher has gone or the ``serve`` process
(``LOCALCHAT_SERVE_PID``) has ended. It imports nothing of localchat's but ``processes``.
"""

from __future__ import annotations

import os
import runpy
import sys

from localchat.processes import SERVE_PID, watch_parent


def main() -> None:
    serve = os.environ.get(SERVE_PID, "")
    watch_parent(lambda: os._exit(1), also=int(serve) if serve.isdigit() else None)
    module, *arguments = sys.argv[1:]
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
