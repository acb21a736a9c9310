"""kvagent.agent"""
