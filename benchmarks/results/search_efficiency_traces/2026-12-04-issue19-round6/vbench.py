import runpy, sys
sys.path.insert(0, "/work/diag/r6"); sys.path.insert(0, "/work/main/benchmarks")
import variants  # noqa
sys.argv = ["search_efficiency.py"] + sys.argv[1:]
runpy.run_path("/work/main/benchmarks/search_efficiency.py", run_name="__main__")
