"""deep_ep._C (DeepEP's CUDA extension) for DeepEP's own utils modules on CPU: the few
names epx provides map to epx's; any other name is a callable that raises when used, so a
test stops at the first call epx does not have, not at import."""


def _epx_names():
    import epx
    import torch
    names = {"topk_idx_t": torch.int64}
    for n in ("EventHandle", "Config"):
        if hasattr(epx, n):
            names[n] = getattr(epx, n)
    return names


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    known = _epx_names()
    if name in known:
        return known[name]

    def missing(*args, **kwargs):
        raise NotImplementedError(f"deep_ep._C.{name}: DeepEP's CUDA extension is not available on CPU (the epx "
                                  "DeepEP shim provides no equivalent)")

    missing.__name__ = name
    return missing
