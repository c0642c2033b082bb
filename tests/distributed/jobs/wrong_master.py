"""init_process_group pointed at a master address nobody answers on (a stale MASTER_ADDR from a job
script, say): every rank's store client retries until the short timeout and gives up."""
import datetime
import os

import torch.distributed as dist

os.environ["MASTER_ADDR"] = os.environ.get("WRONG_MASTER_ADDR", "192.0.2.1")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
print("joined", flush=True)  # never reached
