"""The engine in a process of its own, for ``minisgl serve``: the process that runs ``EngineCore``
(engine_process), the messages between it and the API process (wire), the API side's client (remote), N
engines behind one front (data_parallel), and the HTTP API in front of them (api/).

Nothing is imported here: the engine process is spawned with ``serving.engine_process`` as its target, and a
spawned child imports this package first, so it stays cheap to import.
"""
