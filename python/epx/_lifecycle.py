"""The one life cycle of every epx buffer in Python (EPBuffer, BucketBuffer, PPBuffer,
EngramBuffer and DeepEP V1's Buffer): `destroy()` is collective and idempotent; `with buf:`
destroys at the end of the block; a buffer made with `explicitly_destroy=True` and dropped
without `destroy()` warns (ResourceWarning), since its peers may then wait for it until their
timeout. A class provides `destroy()` and `_is_live()` (True until destroy())."""
import warnings


class BufferLifecycle:
    explicitly_destroy = False

    def _is_live(self):
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False

    def __del__(self):
        # Dropped without destroy(): nothing waits for the peers here (they may be gone); the
        # endpoint goes with the objects that hold it. A half-built object, or one collected
        # at interpreter exit, says nothing.
        try:
            live = self._is_live()
        except Exception:
            return
        if live and self.explicitly_destroy and warnings is not None:
            warnings.warn(f"{type(self).__name__}(explicitly_destroy=True) was garbage-collected without destroy()",
                          ResourceWarning)
