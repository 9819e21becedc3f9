"""An OTLP/HTTP trace receiver for the tests, built on the official OpenTelemetry protobuf
definitions (PyPI opentelemetry-proto): it decodes every ExportTraceServiceRequest posted to
/v1/traces (a body that does not decode is answered 400), writes each span as one JSON line
to the file it is given, and answers with an ExportTraceServiceResponse. Prints its port.

    python otlp_receiver.py SPANS.jsonl
"""
import http.server
import json
import sys

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]


def value(v):
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_error(400, "not an OTLP/HTTP protobuf trace export")
            return
        try:
            request = ExportTraceServiceRequest.FromString(body)
        except DecodeError as e:
            self.send_error(400, f"does not decode: {e}")
            return
        with open(OUT, "a", encoding="utf-8") as out:
            for rs in request.resource_spans:
                resource = {a.key: value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out.write(json.dumps({
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent": s.parent_span_id.hex(),
                            "name": s.name,
                            "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano,
                            "attributes": {a.key: value(a.value) for a in s.attributes},
                            "status": s.status.code,
                            "scope": ss.scope.name,
                            "service": resource.get("service.name"),
                        }) + "\n")
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
print(server.server_address[1], flush=True)
server.serve_forever()
