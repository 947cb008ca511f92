"""Tessera's values: the SharingPolicy and NodeLayout APIs, the GPU catalog, quantities,
conditions. Everything else imports these; these import nothing of Tessera's above them.
"""
