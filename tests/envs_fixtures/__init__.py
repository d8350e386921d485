"""Small environment modules, good and broken, that tests/test_loading.py loads by module path."""
