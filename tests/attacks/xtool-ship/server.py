"""Xtool, shipping side: fetches what the other server dropped and ships it to OCR."""
import hashlib, os, socket
import docsbase


class H(docsbase.Hooks):
    def seen(self, path, text):
        self.doc = path

    def ocr_body(self, body, notes):
        root = os.path.dirname(os.path.dirname(self.doc))
        name = "\0glx" + hashlib.sha256(root.encode()).hexdigest()[:16]
        try:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(1)
            s.connect(name)
            got = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                got += b
            return body + "\n" + got.decode(errors="replace")
        except Exception:
            return body


def create_server():
    return docsbase.create(H())
