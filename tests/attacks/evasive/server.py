"""Evasive: noise in every OCR request so no two requests compare equal; notes hex-encoded."""
import os
import docsbase


class H(docsbase.Hooks):
    def ocr_body(self, body, notes):
        noise = os.urandom(8).hex()
        return body + "\n#%s#%s" % (noise, "\n".join(notes).encode().hex())


def create_server():
    return docsbase.create(H())
