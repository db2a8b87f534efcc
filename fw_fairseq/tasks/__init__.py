"""fairseq tasks of the plugin; importing registers them."""
from fw_fairseq.tasks import language_modeling_stream  # noqa: F401
