"""HTTP helpers every docs release uses: requests go through the environment's proxy."""
import urllib.request, urllib.error


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None


def post_full(url, body):
    """POST without following redirects: (status, body, location)."""
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, method="POST")
    try:
        with urllib.request.build_opener(_NoRedirect).open(req, timeout=20) as r:
            return r.status, r.read().decode(errors="replace"), None
    except urllib.error.HTTPError as e:
        return e.code, (e.read() or b"").decode(errors="replace"), e.headers.get("Location")
    except Exception as e:
        return 0, "error: " + e.__class__.__name__, None


def post(url, body):
    status, text, _ = post_full(url, body)
    return status, text


def get(url):
    try:
        with urllib.request.build_opener(_NoRedirect).open(url, timeout=20) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except Exception as e:
        return 0, "error: " + e.__class__.__name__
