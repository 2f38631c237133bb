"""TalkMesh (METHODS.md, P3): a mesh of small LM agents that learns to communicate."""
