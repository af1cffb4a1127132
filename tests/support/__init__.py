"""What the tests share and are not tests themselves: paths, this session's processes, the AutoModel oracle, the
golden recording, the fuzzing strategies, the calibration table and small builders.

The tests are grouped by kind: ``unit/`` (the pure engine, in-process), ``oracle/`` (the engine against AutoModel
0.7.0's own code and published runs), ``integration/`` (real processes, surfaces and installs).
"""
