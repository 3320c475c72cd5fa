"""Counting HTTP proxy in front of radosgw: forwards every request unchanged (SigV4 signs the Host header,
forwarded as received), logs one line per request: start time, ms, method, path, query, status, client."""
import http.client, socket, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

UP_HOST, UP_PORT = sys.argv[2].split(":")
LOG = open(sys.argv[3], "a", buffering=1)
lock = threading.Lock()
local = threading.local()

def conn():
    c = getattr(local, "c", None)
    if c is None:
        c = local.c = http.client.HTTPConnection(UP_HOST, int(UP_PORT), timeout=120)
        c.connect(); c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = -1
    def setup(self):
        super().setup(); self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    def log_message(self, *a): pass
    def handle_one(self):
        t0 = time.time()
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            body = b""
            while True:
                n = int(self.rfile.readline().split(b";")[0], 16)
                if n == 0:
                    self.rfile.readline(); break
                body += self.rfile.read(n); self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("expect", "transfer-encoding", "content-length", "connection")}
        if body or self.command in ("PUT", "POST"):
            hdrs["Content-Length"] = str(len(body))
        for i in range(2):
            try:
                c = conn(); c.request(self.command, self.path, body=body, headers=hdrs)
                r = c.getresponse(); data = r.read(); break
            except (http.client.HTTPException, OSError):
                local.c = None
                if i: raise
        self.send_response_only(r.status, r.reason)
        for k, v in r.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", r.getheader("Content-Length") or "0")
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()
        ua = self.headers.get("User-Agent", "")
        who = "s3a" if "hadoop" in ua.lower() else ("boto" if "boto" in ua.lower() else "other")
        path, _, q = self.path.partition("?")
        LOG.write(f"{t0:.6f} {(time.time()-t0)*1e3:.2f} {self.command} {path} {q or '-'} {r.status} {who} {len(body)}\n")
    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
