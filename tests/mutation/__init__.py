"""Semantic mutation testing of the verifier: single-point mutants of correct distributed
programs, judged by the numeric oracle and by the verifier (see ``campaign.py``)."""
