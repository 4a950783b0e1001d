"""Graded tests: each test function carries @pytest.mark.points(n) (100 in all) and a timeout.

A parametrized test's points are shared equally among its cases, so a
submission that gets some cases right earns part of them.

They compare against the trusted float64 reference (gqa_flash.reference) on
fresh random inputs, never against a student's own naive code. A test's name
says what it checks, and its failure says where the first wrong value is.
"""
