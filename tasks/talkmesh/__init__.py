"""TalkMesh (P3: docs/methods/p3-talkmesh.md): a mesh of small LM agents that learns to communicate."""
