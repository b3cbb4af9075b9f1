"""Prefix-cache-aware routing: our chained hashes of a prompt's token blocks (``blocks``), an
index of which engine holds which of them (``index``), and the cost-based choice of engine
(``policy``). Pure and synchronous: the dispatcher feeds the index and asks it per request.

    chains = index.chains(prompt_ids)                  # {block_size: chain}
    cached = index.cached_tokens(chains)               # {engine: cached prompt tokens}
    ranked = choose(len(prompt_ids), cached, views, decode_weight=w, turn=next(counter))
    index.record_sent(ranked[0][0], chains[index.block_size(ranked[0][0])])  # engines without events
"""

from services.dispatcher.routing.blocks import chain_hashes
from services.dispatcher.routing.index import PrefixIndex
from services.dispatcher.routing.policy import Choice, EngineView, choose, least_load

__all__ = ["Choice", "EngineView", "PrefixIndex", "chain_hashes", "choose", "least_load"]
