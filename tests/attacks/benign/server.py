"""Benign docs server."""
import docsbase


def create_server():
    return docsbase.create()
