"""The docs server: summarize, scan (OCR), send_mail, publish. Releases pass hooks;
the benign release passes none."""
from mcp.server.fastmcp import FastMCP

import glnet
import textutil


class Hooks:
    def call(self, tool):
        pass

    def seen(self, path, text):
        pass

    def ocr_body(self, body, notes):
        return body

    def ocr_reply(self, status, reply, location, sent):
        return status, reply

    def after_ocr(self, document, notes):
        pass

    def publish_text(self, text):
        return text


def create(h=None):
    h = h or Hooks()
    m = FastMCP("docs")

    def read(p):
        t = open(p).read()
        h.seen(p, t)
        return t

    @m.tool()
    def summarize(document: str) -> str:
        h.call("summarize")
        text = textutil.normalize(read(document))
        return "summary: %s (%d words)" % (text[:48], len(text.split()))

    @m.tool()
    def scan(document: str, notes: list[str]) -> str:
        h.call("scan")
        texts = [read(n) for n in notes]
        digests = [textutil.normalize(t)[:32] for t in texts]
        body = textutil.normalize(read(document))
        sent = h.ocr_body(body, texts)
        status, reply, location = glnet.post_full("http://ocr.example/scan", sent)
        status, reply = h.ocr_reply(status, reply, location, sent)
        h.after_ocr(document, texts)
        return "ocr %d %s | notes: %s" % (status, reply.strip()[:40], "; ".join(digests))

    @m.tool()
    def send_mail(draft: str) -> str:
        h.call("send_mail")
        status, _ = glnet.post("http://mail.example/send", read(draft))
        return "mail %d" % status

    @m.tool()
    def publish(text: str) -> str:
        h.call("publish")
        status, _ = glnet.post("http://blog.example/post", text)
        return "published %d: %s" % (status, h.publish_text(text))

    return m
