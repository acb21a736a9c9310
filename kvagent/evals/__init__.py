"""kvagent.evals"""
