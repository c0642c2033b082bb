"""Non-finite losses and gradients, found without a GPU synchronisation.

- **Loss**: the tensor the job calls `.backward()` on (`torch.Tensor.backward` is wrapped; a
  GradScaler's scaled loss is non-finite exactly when the loss is). At each step of the main
  optimizer the losses of that step (several with gradient accumulation) are tested with
  `isnan(...).any()` and `isinf(...).any()`, queued on the current stream; on a GPU the two flags
  are copied into pinned host memory behind a CUDA event and read at a later step, once the event
  has completed (`Event.query()` never waits). On the CPU they are read at once.
- **Gradients**: every GRAD_EVERY steps the same test on `_foreach_norm` of the main optimizer's
  gradients (one fused launch), per parameter, so the first non-finite one can be named. Not done
  while a GradScaler judges the steps: an inf gradient is then its normal signal to skip a step,
  and amp.py counts those skips.

Only the first non-finite value is reported (one `nonfinite` record: the step, loss or the
parameter's name and shape, nan or inf); the checks then stop. Pinned buffers come from a small
ring: when every one is still in flight (a GPU far behind the host), that step is not checked.
"""

import gc
import importlib
import warnings
import weakref

from _gpufix_probe import stand_in

GRAD_EVERY = 25  # steps between gradient checks: one fused launch over all gradients
RING = 8  # pinned flag buffers in flight at once
MAX_LOSSES = 16  # losses remembered between two steps (gradient accumulation)
MAX_LOSS_NUMEL = 1 << 20  # a "loss" this large is not a loss: not tested
MAX_MODULES_SEARCHED = 200000  # naming the bad parameter walks the live modules once
_INF = float("inf")


class FiniteChecker(object):
    def __init__(self, probe):
        self.probe = probe
        self.torch = probe.torch
        self.losses = []  # detached losses since the last step
        self.pending = []  # [step, what, flags (host tensor), event or None, params or None]
        self.free = []  # pinned 2-element buffers ready for reuse
        self.done = False  # reported (or gave up): no more checks
        self.checked = 0
        self.unchecked = 0  # steps skipped because every buffer was in flight

    def on_backward(self, tensor):
        if self.done or len(self.losses) >= MAX_LOSSES:
            return
        if tensor.numel() > MAX_LOSS_NUMEL or not tensor.is_floating_point():
            return
        self.losses.append(tensor.detach())

    def on_step(self, step, amp_active, optimizer):
        """The end of main-optimizer step `step`: queue its checks, read the finished ones."""
        if self.done:
            return
        self._collect(wait=False)
        losses, self.losses = self.losses, []
        if losses:
            self._queue(step, "loss", losses, None)
        if not amp_active and step % GRAD_EVERY == 0 and not self.done:
            self._queue_gradients(step, optimizer)

    def _queue(self, step, what, tensors, params):
        torch = self.torch
        self.checked += 1
        if params is None and len(tensors) == 1 and tensors[0].device.type == "cpu" and tensors[0].numel() == 1:
            value = tensors[0].item()  # the usual CPU loss: one read, no kernel
            if value != value or value in (_INF, -_INF):
                self._report({"what": "loss", "step": step, "value": "nan" if value != value else "inf"})
            return
        flags = self._flags(tensors, per_item=params is not None)
        if flags.device.type == "cpu":
            self.pending.append([step, what, flags, None, params])
        else:
            host = self._buffer(flags.numel())
            if host is None:
                self.checked -= 1
                self.unchecked += 1
                return
            host.copy_(flags, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(flags.device))
            self.pending.append([step, what, host, event, params])
        self._collect(wait=False)

    def _flags(self, tensors, per_item):
        """uint8 flags: for losses [any nan, any inf]; for gradients [nan per tensor..., inf per tensor...]."""
        torch = self.torch
        with torch.no_grad():
            if per_item:  # one norm per gradient: a non-finite element makes its norm non-finite
                values = torch.stack(torch._foreach_norm(tensors))
                return torch.cat([torch.isnan(values), torch.isinf(values)]).to(torch.uint8)
            device = tensors[0].device
            same = [t for t in tensors if t.device == device]
            nan = torch.stack([torch.isnan(t).any() for t in same]).any()
            nonfinite = torch.stack([~torch.isfinite(t).all() for t in same]).any()
            return torch.stack([nan, nonfinite & ~nan]).to(torch.uint8)

    def _buffer(self, numel):
        for index, buffer in enumerate(self.free):
            if buffer.numel() == numel:
                return self.free.pop(index)
        in_flight = sum(1 for item in self.pending if item[3] is not None)
        if in_flight >= RING:
            return None
        return self.torch.empty(numel, dtype=self.torch.uint8, pin_memory=True)

    def _queue_gradients(self, step, optimizer):
        params = [p for group in getattr(optimizer, "param_groups", ()) for p in group.get("params", ())
                  if getattr(p, "grad", None) is not None and not p.grad.is_sparse]
        if not params:
            return
        by_device = {}
        for param in params:
            by_device.setdefault(param.grad.device, []).append(param)
        for group in by_device.values():
            self._queue(step, "gradient", [p.grad for p in group], [weakref.ref(p) for p in group])

    def _collect(self, wait):
        """Read the checks whose results have arrived (all of them with `wait`: at exit)."""
        keep = []
        for item in self.pending:
            step, what, flags, event, params = item
            if self.done:
                break
            if event is not None and not event.query():
                if not wait:
                    keep.append(item)
                    continue
                event.synchronize()
            values = flags.tolist()
            if event is not None and len(self.free) < RING:
                self.free.append(flags)
            if what == "loss":
                if values[0] or values[1]:
                    self._report({"what": "loss", "step": step, "value": "nan" if values[0] else "inf"})
            else:
                count = len(values) // 2
                for index in range(count):
                    if values[index] or values[count + index]:
                        self._report(self._gradient_record(step, params[index](), values[index]))
                        break
        self.pending = [] if self.done else keep

    def _gradient_record(self, step, param, is_nan):
        record = {"what": "gradient", "step": step, "value": "nan" if is_nan else "inf",
                  "checked_every": GRAD_EVERY}
        if param is not None:
            record["shape"] = list(param.shape)
            name = parameter_name(self.torch, param)
            if name:
                record["param"] = name
        return record

    def _report(self, record):
        self.done = True
        record["kind"] = "nonfinite"
        record["checked_steps"] = self.checked
        self.probe.out.write(record, essential=True)

    def at_exit(self):
        """Read what is still in flight: a job that diverged in its last steps."""
        if not self.done and self.pending:
            self._collect(wait=True)


def parameter_name(torch, param):
    """The dotted name of `param` under its outermost module ('encoder.layers.3.fc1.weight'),
    found by walking the live modules once; None when no module holds it."""
    module_type = torch.nn.Module
    owner = None
    parents = {}
    with warnings.catch_warnings():  # isinstance() on some lazy module objects warns
        warnings.simplefilter("ignore")
        modules = [obj for obj in gc.get_objects()[:MAX_MODULES_SEARCHED * 20] if _is_module(obj, module_type)]
    for obj in modules:
        for child_name, child in getattr(obj, "_modules", {}).items():
            if child is not None:
                parents[id(child)] = (obj, child_name)
        for name, value in getattr(obj, "_parameters", {}).items():
            if value is param:
                owner = (obj, name)
    if owner is None:
        return None
    module, parts = owner[0], [owner[1]]
    seen = set()
    while id(module) in parents and id(module) not in seen:
        seen.add(id(module))
        module, child_name = parents[id(module)]
        parts.append(child_name)
    return ".".join(reversed(parts))


def _is_module(obj, module_type):
    try:
        return isinstance(obj, module_type)
    except Exception:
        return False


def install(probe):
    """Wrap `Tensor.backward` to see each loss (and tell steps.py the forward pass is issued);
    steps.py calls `on_step` at each main step."""
    checker = FiniteChecker(probe)
    probe.finite = checker
    tensor_class = importlib.import_module("torch").Tensor
    real_backward = tensor_class.backward

    def backward(self, *args, **kwargs):
        steps = getattr(probe, "steps", None)
        if probe.enabled and steps is not None:
            try:
                steps.on_backward()  # the forward pass of the batch is issued: its compute time
            except Exception as exc:
                probe.fail("compute time", exc)
        if probe.enabled and not checker.done:
            try:
                checker.on_backward(self)
            except Exception as exc:
                probe.fail("loss check", exc)
        return real_backward(self, *args, **kwargs)

    stand_in(backward, real_backward)
    tensor_class.backward = backward
