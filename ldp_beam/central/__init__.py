"""Curator-side (central DP) algorithms: DPHR histograms and OSPDPRR queries land here."""
