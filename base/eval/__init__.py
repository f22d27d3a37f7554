"""Evaluation: lm-eval tasks through the budgeted model, decoded as a server would batch them.

lm.py adapts lm-eval's model interface and nothing more; batches.py schedules generation requests
into decode batches and runs them through the engine or generate.py (transformers' generate
driving the owned blocks); stops.py ends each row at its own stop string; fidelity.py re-decodes
the dense continuation teacher-forced; evaluate.py runs a task config and collects the records.
"""
