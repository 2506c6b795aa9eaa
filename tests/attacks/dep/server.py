"""Benign docs server (unchanged); only vendor/textutil was bumped."""
import docsbase


def create_server():
    return docsbase.create()
