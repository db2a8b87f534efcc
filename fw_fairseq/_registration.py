"""Registering the plugin with fairseq once fairseq is imported, without importing fairseq here.

The models, tasks, baselines and criterions register themselves with decorators on fairseq's registries, so importing
them imports fairseq. `import fw_fairseq` must not (the ops need no fairseq), yet a later `import fairseq` has to find
the models, as `import fw_fairseq` after fairseq does. RegisterWithFairseq, on sys.meta_path until then, wraps two
kinds of loaders: fairseq's own, to register once fairseq's package has run; and the plugin's modules', because a
plugin module (fw_fairseq.models.checkpoints, say) may be what imports fairseq first, and registering at that moment
would import modules that are still half-run. The registration then waits until the outermost plugin module being
imported has finished.
"""
import importlib
import importlib.abc
import sys

# transformer_fw*, fw_lm_stream, feedback_transformer_lm*, fw_attention_distillation and fw_unlikelihood
REGISTERING = ("models", "tasks", "baselines", "criterions")


def register():
    for name in REGISTERING:
        importlib.import_module(f"fw_fairseq.{name}")


class RegisterWithFairseq(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it hands back the spec the other finders give fairseq and the plugin's modules, with the
    loader wrapped, and leaves sys.meta_path once the registration has run. A find_spec that loads nothing (a check
    whether fairseq is installed) leaves it in place."""

    def __init__(self):
        self.depth = 0  # plugin modules running, one inside another
        self.pending = False  # fairseq has loaded, the plugin is not registered yet

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "fairseq" and not fullname.startswith("fw_fairseq."):
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = None if finder is self or find_spec is None else find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _Wrapped(spec.loader, self, fairseq=fullname == "fairseq")
        return spec

    def loaded(self, fairseq):
        self.pending = self.pending or fairseq
        if self.pending and self.depth == 0:
            self.pending = False
            sys.meta_path.remove(self)
            register()


class _Wrapped(importlib.abc.Loader):
    """A module's own loader, run as it is; the finder hears when the module has run. The module keeps its own
    loader afterwards."""

    def __init__(self, loader, finder, fairseq):
        self.loader, self.finder, self.fairseq = loader, finder, fairseq

    def __getattr__(self, name):  # get_source, get_resource_reader, ... of the wrapped loader
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        counted = not self.fairseq
        self.finder.depth += counted
        try:
            self.loader.exec_module(module)
        finally:
            self.finder.depth -= counted
        module.__loader__ = module.__spec__.loader = self.loader
        self.finder.loaded(self.fairseq)
