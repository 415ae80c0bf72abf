"""Putting a block of text into other people's files, safely: InferenceX's benchmark_lib.sh and
a sitecustomize.py. It never imports ``probe``: the CLI hands it the payload to put there."""
