"""
What happened to a write, and what the agent is told: an answer or a transport failure as a
state (classify.py, exchange_failures.py, an MCP tool call's: tool_outcomes.py, its interim
answers and tasks), and the proxy's own answers, over HTTP (http_answers.py) and as MCP tool
results (tool_answers.py).
"""
