"""The serving runtime: one process per subserver (engine + core scheduler + router), a front-end process
(OpenAI-compatible HTTP), ZeroMQ between them. Imports nothing heavy at package level."""
