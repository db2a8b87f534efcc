"""fairseq models of the plugin; importing registers them."""
from fw_fairseq.models import transformer_fw  # noqa: F401
from fw_fairseq.models import transformer_lm_fw  # noqa: F401
