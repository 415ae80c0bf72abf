"""The reader: turns a result directory into verdicts. Imports neither lm-eval nor the patcher;
from the runtime it shares only the pure core: the contract's names, the one definition of a
valid sidecar (``probe.runtime.core.sidecar``) and what the rule counts (``probe.runtime.core.evidence``)."""
