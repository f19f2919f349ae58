"""An ingest worker in its own process, for kill and SIGTERM tests: ``python -m tests.api.worker_proc URL block|slow``.

It prints ENCODING once the fake encoder has been handed a batch: ``block`` then never returns (the
test kills the process), ``slow`` returns after two seconds (the test sends SIGTERM meanwhile).
"""

from __future__ import annotations

import sys
import threading

from memstore.db.core import Database, create_engine
from memstore.settings import IngestSettings
from memstore.workers.ingest import IngestWorker
from tests.api.api_helpers import FakeBackend


def main() -> int:
    url, mode = sys.argv[1], sys.argv[2]
    backend = FakeBackend()
    backend.gate = threading.Event()
    if mode == "slow":
        threading.Timer(2.0, backend.gate.set).start()

    def announce() -> None:
        backend.entered.wait()
        print("ENCODING", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    worker = IngestWorker(
        Database(create_engine(url)), backend, settings=IngestSettings(batch_size=100, poll_interval_s=0.2)
    )
    code = worker.run()
    print(f"EXIT {code} written={worker.totals.written}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
