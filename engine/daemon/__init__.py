"""The engine daemon: the one detached process per $CARL_HOME that follows sources, runs engine commands
from the store's queue and supervises training runs, evals and the agents plane (loop.py).

Other processes start, stop and ask after it through engine.control; `carl engine ...` is carl_engine.py and
`python -m engine.daemon run` is what engine.control spawns.
"""
