"""A run's results in the benchmark tools' terms: their metrics computed by their definitions
(:mod:`.metrics`), each request's token gaps (:mod:`.gaps`), and writers of their result files
(:mod:`.vllm`, :mod:`.aiperf`, :mod:`.guidellm`) that ``workloads.from_benchmark`` reads back.

May import ``sim.results`` (its :class:`~sim.results.metrics.Result`), numpy and the standard
library; nothing of the engine. The schema each writer follows is named in its docstring.
"""

FORMATS = ("vllm-bench", "aiperf", "guidellm")  # the tools, as ``sim run --format`` names them
