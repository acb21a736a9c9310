"""kvagent.sandbox"""
