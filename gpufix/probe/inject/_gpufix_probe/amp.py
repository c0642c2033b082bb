"""AMP's GradScaler, watched read-only: the optimizer steps it skips and its loss scale.

`GradScaler.step(optimizer)` checks the gradients for inf/NaN (its own `.item()`: the one GPU
synchronisation it makes) and calls `optimizer.step()` only when they are finite; `update()` then
halves the scale after a skip and grows it after `growth_interval` clean iterations. PyTorch prints
nothing either way, so a run whose gradients overflow at every step trains nothing, silently.

- **Skipped steps**: `GradScaler.step` is wrapped. The probe's optimizer post-hook fires inside
  `optimizer.step()`; when it did not fire during `scaler.step(optimizer)` (and the optimizer's
  class has torch's step hooks), the scaler skipped the step. No tensor is read for that. The
  skipped step of the main optimizer is counted as a step (an iteration boundary, so step times
  stay per iteration), marked `skipped`.
- **Loss scale**: a tensor on the scaler's device (`_scale`); reading it on a GPU is a
  synchronisation. It is not read in a normal step. The probe follows it instead, from what it
  saw: `_init_scale` at the start (and after `load_state_dict`), `update()` multiplying it by
  `backoff_factor` after a skip and by `growth_factor` after `growth_interval` clean updates, in
  float32 as torch's kernel does. The tensor is read only where that costs nothing: right after a
  skipped step when the probe does not know the scale (the scaler has just waited for the GPU
  in its own `.item()` and nothing was queued since), or when it lives on the CPU.
- Not seen: skips inside optimizers that check `found_inf` themselves on the device (`fused=True`
  Adam/AdamW/SGD: `_step_supports_amp_scaling`; their `step()` always runs) and `unscale_()`
  results the job passes to `update()` without a `step()`: the scale is then unknown (on a GPU)
  until the next skip the probe sees. A subclass with its own `update()` (FSDP's
  ShardedGradScaler) is not followed: its scale is known only at skips.
"""

import importlib
import math
import struct
import weakref

from _gpufix_probe import stand_in

_F32 = struct.Struct("f")


def _f32(value):
    """`value` rounded to float32, as the scale tensor stores it (inf past float32's range)."""
    try:
        return _F32.unpack(_F32.pack(value))[0]
    except (OverflowError, struct.error):
        return math.copysign(float("inf"), value)


def _finite(value):
    return value is not None and not math.isinf(value) and not math.isnan(value)


class ScalerState(object):
    """What the probe knows about one GradScaler."""

    __slots__ = ("scale", "growth", "inf", "blind", "followed", "minimum", "last")

    def __init__(self, scaler, followed):
        self.followed = followed  # its update() is the wrapped one: the scale can be followed
        self.inf = False  # a step skipped since the last update()
        self.blind = False  # a step since the last update() whose skip could not be seen
        self.minimum = None
        self.last = None
        self.scale = None
        self.growth = None
        if followed:
            self.reset(scaler)

    def reset(self, scaler):
        """The scaler's own starting point: the scale and growth tracker it (re)starts from."""
        scale = getattr(scaler, "_init_scale", None)
        growth = getattr(scaler, "_init_growth_tracker", None)
        self.scale = _f32(float(scale)) if isinstance(scale, (int, float)) else None
        self.growth = growth if isinstance(growth, int) else None
        self.note(self.scale)

    def note(self, scale):
        if _finite(scale):
            self.last = scale
            if self.minimum is None or scale < self.minimum:
                self.minimum = scale

    def current(self, scaler):
        """The scale now, where known without a GPU synchronisation (the followed value, or a
        read of a scale tensor that lives on the CPU); None otherwise."""
        if self.followed and self.scale is not None:
            return self.scale
        scale = _read_cpu_scale(scaler)
        if scale is not None and self.followed:
            self.scale = scale
        self.note(scale)
        return scale


def _read_cpu_scale(scaler):
    tensor = getattr(scaler, "_scale", None)
    if tensor is None or tensor.device.type != "cpu":
        return None
    return _f32(float(tensor.item()))


def _read_scale(scaler):
    """The scale tensor's value. Called only right after a skipped step: the scaler's own
    `.item()` has just waited for the device and no work was queued after it."""
    tensor = getattr(scaler, "_scale", None)
    return None if tensor is None else _f32(float(tensor.item()))


class AmpWatcher(object):
    def __init__(self, probe, module):
        self.probe = probe
        self.tracker = probe.steps
        self.stepped = getattr(getattr(module, "OptState", None), "STEPPED", None)
        self.states = weakref.WeakKeyDictionary()  # GradScaler -> ScalerState
        self.update_wrapper = None
        self.load_wrapper = None

    def state(self, scaler):
        state = self.states.get(scaler)
        if state is None:
            cls = type(scaler)
            followed = (getattr(cls, "update", None) is self.update_wrapper
                        and getattr(cls, "load_state_dict", None) is self.load_wrapper)
            state = ScalerState(scaler, followed)
            self.states[scaler] = state
        return state

    # -- GradScaler.step ----------------------------------------------------------------------

    def before_step(self, scaler, optimizer):
        """(state, scaler, hook calls so far), or None when a skip cannot be seen."""
        state = self.state(scaler)
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            state.blind = True  # the optimizer reads found_inf on the device; its step() always runs
            return None
        return (state, scaler, self.tracker.hook_calls)

    def after_step(self, optimizer, token):
        state, scaler, calls = token
        tracker = self.tracker
        if tracker.hook_calls != calls:
            return  # optimizer.step() ran: the hook counted the step
        if not getattr(getattr(type(optimizer), "step", None), "hooked", False):
            state.blind = True  # an optimizer without torch's step hooks: a skip cannot be told apart
            return
        state.inf = True
        scale = state.scale if state.followed else None
        if scale is None:
            scale = _read_scale(scaler)
            if state.followed:
                state.scale = scale
        state.note(scale)
        tracker.on_optimizer_step(optimizer, skipped=True, amp=token, scale=scale)

    # -- GradScaler.update / load_state_dict ----------------------------------------------------

    def before_update(self, scaler, args, kwargs):
        """(new_scale, whether update() will consume an inf check the probe did not see)."""
        new_scale = args[0] if args else kwargs.get("new_scale")
        unseen = False
        if new_scale is None:
            for entry in getattr(scaler, "_per_optimizer_states", {}).values():
                if entry.get("found_inf_per_device") and entry.get("stage") is not self.stepped:
                    unseen = True  # unscale_() without step(): found_inf the probe never saw
        return new_scale, unseen

    def after_update(self, scaler, token):
        new_scale, unseen = token
        state = self.state(scaler)
        if not state.followed:
            return
        if new_scale is not None:  # torch: a float fills the scale; a tensor is copied; the tracker stays
            state.scale = _f32(new_scale) if isinstance(new_scale, float) else None
        elif state.blind or unseen:
            state.scale = state.growth = None
        elif state.inf:
            if state.scale is not None:
                state.scale = _f32(state.scale * float(scaler._backoff_factor))
            state.growth = 0
        elif state.growth is None:
            state.scale = None  # a growth may have happened unseen
        else:
            growth = state.growth + 1
            if growth == scaler._growth_interval:
                if state.scale is not None:
                    grown = _f32(state.scale * float(scaler._growth_factor))
                    if _finite(grown):
                        state.scale = grown
                growth = 0
            state.growth = growth
        state.inf = state.blind = False
        if state.scale is None:
            state.current(scaler)  # a scale on the CPU is read (free); notes it
        else:
            state.note(state.scale)

    def after_load(self, scaler):
        state = self.state(scaler)
        state.inf = state.blind = False
        if state.followed:
            state.reset(scaler)


def install(probe):
    """Wrap GradScaler.step, .update and .load_state_dict (the deprecated torch.cuda.amp and
    torch.cpu.amp GradScalers subclass torch.amp's and inherit them)."""
    if probe.steps is None:
        return
    module = importlib.import_module("torch.amp.grad_scaler")
    cls = module.GradScaler
    watcher = AmpWatcher(probe, module)
    probe.amp = watcher
    tracker = probe.steps
    real_step, real_update, real_load = cls.step, cls.update, cls.load_state_dict

    def step(self, optimizer, *args, **kwargs):
        if not probe.enabled or not getattr(self, "_enabled", False):
            return real_step(self, optimizer, *args, **kwargs)
        try:
            token = watcher.before_step(self, optimizer)
        except Exception as exc:
            probe.fail("GradScaler step", exc)
            return real_step(self, optimizer, *args, **kwargs)
        previous = tracker.amp_current
        tracker.amp_current = token
        try:
            result = real_step(self, optimizer, *args, **kwargs)
        finally:
            tracker.amp_current = previous
        if token is not None and probe.enabled:
            try:
                watcher.after_step(optimizer, token)
            except Exception as exc:
                probe.fail("GradScaler step", exc)
        return result

    def update(self, *args, **kwargs):
        if not probe.enabled or not getattr(self, "_enabled", False):
            return real_update(self, *args, **kwargs)
        try:
            token = watcher.before_update(self, args, kwargs)
        except Exception as exc:
            probe.fail("GradScaler update", exc)
            return real_update(self, *args, **kwargs)
        result = real_update(self, *args, **kwargs)
        if probe.enabled:
            try:
                watcher.after_update(self, token)
            except Exception as exc:
                probe.fail("GradScaler update", exc)
        return result

    def load_state_dict(self, *args, **kwargs):
        result = real_load(self, *args, **kwargs)
        if probe.enabled:
            try:
                watcher.after_load(self)
            except Exception as exc:
                probe.fail("GradScaler load_state_dict", exc)
        return result

    for wrapper, real in ((step, real_step), (update, real_update), (load_state_dict, real_load)):
        stand_in(wrapper, real)
    watcher.update_wrapper = update
    watcher.load_wrapper = load_state_dict
    cls.step = step
    cls.update = update
    cls.load_state_dict = load_state_dict


def install_autocast(probe):
    """Note each kind of autocast region the job enters (device and dtype, once each): the
    precision it trains in, so advice such as "bf16 instead of fp16" fits the run."""
    cls = importlib.import_module("torch.amp.autocast_mode").autocast
    real_enter = cls.__enter__
    seen = set()

    def __enter__(self):
        if probe.enabled:
            try:
                key = (getattr(self, "device", None), str(getattr(self, "fast_dtype", None)),
                       bool(getattr(self, "_enabled", True)))
                if key not in seen and len(seen) < 8:
                    seen.add(key)
                    probe.out.write({"kind": "autocast", "device": key[0], "dtype": key[1].replace("torch.", ""),
                                     "enabled": key[2]})
            except Exception as exc:
                probe.fail("autocast", exc)
        return real_enter(self)

    stand_in(__enter__, real_enter)
    cls.__enter__ = __enter__
