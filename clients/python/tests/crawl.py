"""Runs one real Scrapy crawl (``CrawlerProcess``) for test_scrapy.py, in a process of its
own: Twisted's reactor cannot be started twice in one process.

``python crawl.py CONFIG OUT``: CONFIG is a JSON file with ``settings``, ``urls`` and the
``meta`` of each request; OUT
gets the scraped items and the crawl's stats as JSON.
"""

import json
import sys
from typing import Any, Dict, List

import scrapy
from scrapy import signals
from scrapy.crawler import CrawlerProcess


class SiteSpider(scrapy.Spider):
    """Fetches the given URLs and records, per page, the member it went out through."""

    name = "site"

    def __init__(self, urls: List[str], meta: Dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = urls
        self.request_meta = meta

    async def start(self) -> Any:
        for url in self.urls:
            yield scrapy.Request(url, meta=dict(self.request_meta))

    def parse(self, response: scrapy.http.Response) -> Any:
        yield {"url": response.url, "status": response.status,
               "proxy": response.meta.get("proxy_allocator_proxy")}


def main() -> None:
    with open(sys.argv[1]) as file:
        config = json.load(file)
    items: List[Dict[str, Any]] = []
    process = CrawlerProcess(settings=config["settings"])
    crawler = process.create_crawler(SiteSpider)

    def scraped(item: Dict[str, Any], **_: Any) -> None:
        items.append(dict(item))

    # Scrapy holds receivers weakly: this one lives as long as main().
    crawler.signals.connect(scraped, signal=signals.item_scraped)
    process.crawl(crawler, urls=config["urls"], meta=config["meta"])
    process.start()
    assert crawler.stats is not None
    with open(sys.argv[2], "w") as out:
        json.dump({"items": items, "stats": crawler.stats.get_stats()}, out, default=str)


if __name__ == "__main__":
    main()
