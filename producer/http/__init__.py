"""The HTTP front (`cosyq serve`, extra `cosyq[http]`): one more producer on the same queue.

Importing it needs FastAPI; `import producer` never does (a test checks).
"""
