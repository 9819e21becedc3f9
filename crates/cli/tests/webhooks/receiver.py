"""A webhook receiver for the tests, verifying every delivery with the Standard Webhooks
reference library (PyPI `standardwebhooks`, independent of Baton's signing).

Usage: receiver.py PORT SECRETS_FILE LOG_FILE

SECRETS_FILE holds one secret per line and is read again for each delivery, so a test can
add a rotated secret. Each delivery that verifies under at least one secret is answered
204 and logged as one JSON line: its `webhook-id`, whether it was the first with that id
(deduplication), the indexes of the secrets that verified it, and its body. One that
verifies under none is answered 400 and logged with `rejected`.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

PORT = int(sys.argv[1])
SECRETS = sys.argv[2]
LOG = sys.argv[3]
SEEN: set = set()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        with open(SECRETS) as f:
            secrets = [line.strip() for line in f if line.strip()]
        verified = []
        for index, secret in enumerate(secrets):
            try:
                Webhook(secret).verify(body, headers)
                verified.append(index)
            except Exception:
                pass
        message_id = headers.get("webhook-id", "")
        entry = {"id": message_id, "verified": verified}
        if verified:
            entry["first"] = message_id not in SEEN
            SEEN.add(message_id)
            entry["body"] = json.loads(body)
        else:
            entry["rejected"] = True
        with open(LOG, "a") as f:
            f.write(json.dumps(entry) + "\n")
        self.send_response(204 if verified else 400)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
