"""The dashboard: the results store rendered as a self-contained interactive site (ARCHITECTURE §8).

Plotly draws it: the plotly Python package ships plotly.min.js for offline embedding, so the site
needs nothing from the network, and its WebGL traces keep a 50,000-request drill-down fast.
"""
