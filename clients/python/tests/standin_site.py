"""A stand-in for the internet in a Scrapy crawl of the client README's spider: a download
handler that answers every request itself, as the site would, and writes down what reached
it (the URL, the proxy Scrapy would have dialled, the proxy credentials it would have sent)
as one JSON line in the file named by ``STANDIN_SITE_LOG``.

Only the download is stood in for: the middleware under test, Scrapy's own
``HttpProxyMiddleware`` and every other downloader middleware run as they do in a real
crawl.
"""

import json
import os

from scrapy import Request
from scrapy.core.downloader.handlers.base import BaseDownloadHandler
from scrapy.http import HtmlResponse, Response


class StandInSite(BaseDownloadHandler):
    """Answers 200 and a small HTML page to every request."""

    async def download_request(self, request: Request) -> Response:
        authorization = request.headers.get("Proxy-Authorization")
        with open(os.environ["STANDIN_SITE_LOG"], "a", encoding="utf-8") as log:
            log.write(json.dumps({
                "url": request.url,
                "proxy": request.meta.get("proxy"),
                "proxy_authorization": None if authorization is None else authorization.decode(),
            }) + "\n")
        return HtmlResponse(request.url, status=200, body=b"<html><body>page</body></html>",
                            request=request)
