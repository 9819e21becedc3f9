"""A small ticket service for the ticket-triage scenario and its tests (Python's standard
library only).

    python3 scenarios/services/tickets.py [--port N] [--port-file FILE]

It listens on 127.0.0.1, port N (8765 for the ticket_triage scenario) or a free one,
written to FILE and printed, and serves:

    GET  /tickets                    every ticket
    GET  /tickets/ID                 one ticket (404 when there is none)
    POST /tickets/ID/replies         a reply ({"text": ...}); with an Idempotency-Key, a
                                     key seen before applies nothing again and answers
                                     what the first request did
    GET  /echo                       the request's headers, as JSON
    GET  /big?bytes=N                N bytes of text
    GET  /moved/same                 a redirect to /tickets/7 (the same host)
    GET  /moved/away                 a redirect to localhost, another host name
    GET  /effects                    what it was asked: requests per idempotency key,
                                     the replies applied, every request's headers
    ?delay=S on any request          answers S seconds late (a request in flight)
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

TICKETS = {
    "7": {"id": 7, "title": "Checkout fails with a 500", "body": "Since this morning every checkout ends in an error page.", "urgent": True},
    "8": {"id": 8, "title": "Typo on the pricing page", "body": "It says 'monthy' instead of 'monthly'.", "urgent": False},
}

lock = threading.Lock()
seen = {}       # idempotency key -> requests that carried it
applied = []    # replies applied, in order
answers = {}    # idempotency key -> the answer of its first request
requests = []   # every request: method, path, headers


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def redirect(self, location):
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def setup_request(self):
        url = urlparse(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with lock:
            requests.append({"method": self.command, "path": url.path, "headers": dict(self.headers), "body": body.decode("utf-8", "replace")})
        delay = float(query.get("delay", ["0"])[0])
        if delay:
            time.sleep(delay)
        return url, query, body

    def do_GET(self):
        url, query, _ = self.setup_request()
        parts = url.path.strip("/").split("/")
        if parts == ["tickets"]:
            return self.answer(200, list(TICKETS.values()))
        if len(parts) == 2 and parts[0] == "tickets":
            ticket = TICKETS.get(parts[1])
            return self.answer(200, ticket) if ticket else self.answer(404, {"error": "no such ticket"})
        if parts == ["echo"]:
            return self.answer(200, {"headers": dict(self.headers)})
        if parts == ["moved", "same"]:
            return self.redirect("/tickets/7")
        if parts == ["moved", "away"]:
            return self.redirect(f"http://localhost:{self.server.server_address[1]}/echo")
        if parts == ["big"]:
            size = int(query.get("bytes", ["1000"])[0])
            body = b"x" * size
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.wfile.write(body)
            return None
        if parts == ["effects"]:
            with lock:
                return self.answer(200, {"seen": seen, "applied": applied, "requests": requests})
        return self.answer(404, {"error": "not found"})

    def do_POST(self):
        url, _, body = self.setup_request()
        parts = url.path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "tickets" or parts[2] != "replies" or parts[1] not in TICKETS:
            return self.answer(404, {"error": "not found"})
        try:
            text = json.loads(body or b"{}").get("text", "")
        except ValueError:
            return self.answer(400, {"error": "the body is not JSON"})
        key = self.headers.get("Idempotency-Key")
        with lock:
            if key:
                seen[key] = seen.get(key, 0) + 1
                if key in answers:
                    return self.answer(200, answers[key])
            applied.append({"key": key, "ticket": int(parts[1]), "text": text})
            result = {"ticket": int(parts[1]), "posted": True}
            if key:
                answers[key] = result
        return self.answer(201, result)


def main():
    port_file = None
    port = 0
    args = sys.argv[1:]
    while args:
        flag = args.pop(0)
        if flag == "--port-file" and args:
            port_file = args.pop(0)
        elif flag == "--port" and args:
            port = int(args.pop(0))
        else:
            sys.exit(f"unknown argument {flag}; usage: tickets.py [--port N] [--port-file FILE]")
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    port = server.server_address[1]
    if port_file:
        with open(port_file + ".tmp", "w") as f:
            f.write(str(port))
        import os
        os.replace(port_file + ".tmp", port_file)
    print(f"listening on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
