"""Reports: regression against published numbers and history; plots; Allure."""
