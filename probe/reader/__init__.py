"""The reader: turns a result directory into a verdict. Imports neither lm-eval nor the patcher;
it shares only the contract's names with the runtime (``probe.runtime.contract``)."""
