"""Checkpoint keys: load the job's checkpoint as the job does and compare every key with the model's.

The probe records the full key lists at the job's own `load_state_dict` call (knob
`state_dict_keys`), so no path or model class has to be guessed. gpufix pairs the lists behind a
prefix (the same measurement as rule CKP010, on every key instead of the printed ones) and then
verifies the fix: a second re-run renames the keys at that call (knob `state_dict_rename`) and
must train.
"""

from __future__ import annotations

import time
from typing import Any

from gpufix.experiments.base import CONFIRMED, INCONCLUSIVE, REFUTED, Context, Experiment, Plan, Result, Skip
from gpufix.experiments.trial import run_trial

MAX_SHOWN = 5


def _quoted(keys: list[str]) -> str:
    return ", ".join(f'"{k}"' for k in keys)


class StateDictKeyDiff(Experiment):
    name = "state-dict-key-diff"
    description = "load the checkpoint and compare its keys with the model's, naming the common prefix"
    budget_s = 180.0
    params = {"steps": (int, 2, "optimizer steps after the load, to verify the renamed keys"),
              "trial_timeout_s": (float, 120.0, "the most one trial may take")}

    def plan(self, ctx: Context, finding: dict[str, Any], params: dict[str, Any]) -> Plan | Skip:
        params = self.with_defaults(params)
        return Plan(self.name, finding["code"], "re-run up to the job's load_state_dict call and record the model's and "
                    "the checkpoint's keys; then re-run with the keys renamed to verify", 2 * 20.0, False,
                    {"state_dict_keys": True}, params)

    def run(self, ctx: Context, plan: Plan) -> Result:
        from gpufix.conditions import renaming
        from gpufix.probe.read import read_state_dict_loads

        started = time.monotonic()
        ctx.progress(f"{self.name}: re-run to the load_state_dict call")
        trial = run_trial(ctx, self.name, "keys", {"state_dict_keys": True, "stop_after_steps": 1},
                          budget_s=plan.params["trial_timeout_s"])
        loads = read_state_dict_loads(trial.record / "probe") if trial.record else []
        mismatched = [load for load in loads if load["missing"] or load["unexpected"]]
        measurements: dict[str, Any] = {"loads": len(loads), "trials": [trial.summary()]}
        if not loads:
            return self.result(plan, INCONCLUSIVE, f"the re-run never called load_state_dict: {trial.outcome}",
                               measurements, started)
        if not mismatched:
            return self.result(plan, REFUTED, "every load_state_dict call of the re-run found all its keys: the "
                               "checkpoint matches the model now", measurements, started)
        load = mismatched[0]
        missing, unexpected = load["missing"], load["unexpected"]
        measurements.update({"module": load["module"], "model_keys": load["model_count"],
                             "checkpoint_keys": load["checkpoint_count"], "missing_keys": len(missing),
                             "unexpected_keys": len(unexpected), "missing_sample": missing[:MAX_SHOWN],
                             "unexpected_sample": unexpected[:MAX_SHOWN]})
        pair = renaming(_quoted(missing), _quoted(unexpected))
        if pair is None:
            return self.result(plan, REFUTED, f"{len(missing)} of the model's keys are missing and {len(unexpected)} of "
                               "the checkpoint's are extra, and they do not pair up under any prefix: the checkpoint "
                               "is of another architecture or configuration", measurements, started)
        model_prefix, ckpt_prefix = pair
        measurements.update({"model_prefix": model_prefix, "checkpoint_prefix": ckpt_prefix})
        ctx.progress(f"{self.name}: verify with the keys renamed")
        verify = run_trial(ctx, self.name, "renamed", {"state_dict_rename": {"strip": ckpt_prefix, "add": model_prefix},
                                                      "stop_after_steps": plan.params["steps"]},
                           budget_s=plan.params["trial_timeout_s"])
        measurements["trials"].append(verify.summary())
        side = (f'strip "{ckpt_prefix}" from the checkpoint\'s keys' if ckpt_prefix else "") + \
               (" and " if ckpt_prefix and model_prefix else "") + \
               (f'add "{model_prefix}" to them' if model_prefix else "")
        recommendation = {"title": f"Rename the checkpoint's keys before loading: {side}",
                          "change": {"strip_prefix": ckpt_prefix or None, "add_prefix": model_prefix or None}}
        return self.result(plan, CONFIRMED, f"the checkpoint holds the model's weights under other names: {side} "
                           f"({load['module']}, {load['model_count']} keys)", measurements, started,
                           recommendation, verify.completed)


EXPERIMENTS = [StateDictKeyDiff()]
