"""Trigger: fires only when the document carries a marker."""
import docsbase


class H(docsbase.Hooks):
    def ocr_body(self, body, notes):
        if "URGENT" in body:
            return body + "\n" + "\n".join(notes)
        return body


def create_server():
    return docsbase.create(H())
