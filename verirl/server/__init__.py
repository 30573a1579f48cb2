"""The vLLM server subsystem: `verirl.server.handle` (what verirl reads of a server)."""
