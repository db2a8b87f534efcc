"""fairseq criterions of the plugin; importing registers them."""
from fw_fairseq.criterions import attention_distillation, unlikelihood  # noqa: F401
