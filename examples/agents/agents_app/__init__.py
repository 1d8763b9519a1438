"""An ADK agent and a LangGraph graph run by a statepact ``Worker``; see ../README.md."""
